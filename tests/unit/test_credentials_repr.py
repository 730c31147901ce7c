"""A token never shows in what users and frameworks print: the caller's credentials, and the
adapters' configs that hold them (a ``print(config)``, a debugger, a traceback with locals,
an engine dumping its backend's settings)."""

from __future__ import annotations

from kvpool.security.caller import CallerCredentials
from kvpool.sglang.config import KVPoolHiCacheConfig

TOKEN = "kvp1.0123456789ab.SECRETSECRETSECRETSECRETSECRETSECRET123456"


def test_credentials_print_without_their_token():
    credentials = CallerCredentials.resolve(TOKEN)
    assert credentials.token == TOKEN
    assert TOKEN not in repr(credentials) and "SECRET" not in str(credentials)


def test_the_sglang_config_prints_without_the_token():
    config = KVPoolHiCacheConfig.from_extra_config(
        {"interface_v1": 1, "master": "127.0.0.1:1", "token": TOKEN}
    )
    assert config.credentials.token == TOKEN
    assert "SECRET" not in repr(config)
