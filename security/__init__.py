"""Who may call what: identities and roles, bearer tokens stored as hashes, TLS material that
is picked up again when rotated, and a throwaway certificate authority for local clusters and
tests. Sans-IO where it can be: the master's handlers ask ``policy`` before the core runs.
"""
