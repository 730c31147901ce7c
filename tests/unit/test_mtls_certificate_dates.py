"""A client refuses its own certificate before connecting only when it is out of its dates by
more than the clock leeway: the master checks with its own clock, which may differ a little
(a certificate just made, or just expired, is left to the master)."""

from __future__ import annotations

import datetime

import pytest

from kvpool.client.master_link import CLOCK_LEEWAY, certificate_dates_problem
from kvpool.security.dev_pki import make_dev_pki


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """A certificate and its validity dates."""
    from cryptography import x509

    pki = make_dev_pki(tmp_path_factory.mktemp("pki"), days=1)
    path, _ = pki.client_certificate("kvpool://client/default/alice", "alice")
    loaded = x509.load_pem_x509_certificate(path.read_bytes())
    return path, loaded.not_valid_before_utc, loaded.not_valid_after_utc


def test_a_current_certificate_has_no_problem(certificate):
    path, start, end = certificate
    assert certificate_dates_problem(path, start + (end - start) / 2) == ""


@pytest.mark.parametrize("slack", [datetime.timedelta(0), CLOCK_LEEWAY])
def test_within_the_leeway_it_is_left_to_the_master(certificate, slack):
    path, start, end = certificate
    assert certificate_dates_problem(path, end + slack) == ""
    assert certificate_dates_problem(path, start - slack) == ""


def test_beyond_the_leeway_it_says_expired_or_not_yet_valid_with_the_dates(certificate):
    path, start, end = certificate
    beyond = CLOCK_LEEWAY + datetime.timedelta(seconds=1)
    expired = certificate_dates_problem(path, end + beyond)
    assert "has expired" in expired and str(path) in expired and f"{end:%Y-%m-%d}" in expired
    early = certificate_dates_problem(path, start - beyond)
    assert "not valid yet" in early and f"{start:%Y-%m-%d}" in early


def test_a_file_that_is_no_certificate_is_left_to_the_tls_checks(tmp_path):
    junk = tmp_path / "junk.crt"
    junk.write_text("not a certificate")
    assert certificate_dates_problem(junk, datetime.datetime.now(datetime.UTC)) == ""
    assert (
        certificate_dates_problem(tmp_path / "missing.crt", datetime.datetime.now(datetime.UTC))
        == ""
    )
