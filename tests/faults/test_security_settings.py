"""Kafka SASL/TLS and Redis credentials travel from settings to every client, unlogged.

``rankstream.services.stack.kafka_client_options`` is the one function that turns
the security settings into kafka-python keywords; the consumer (events and dead
letters), the producer and the service probes all use it. These checks pin what
it builds for each supported combination (PLAINTEXT, SASL_PLAINTEXT with PLAIN,
SASL_SSL with SCRAM, SSL) and that secrets are SecretStr everywhere else. A live
SASL broker is not part of CI (docs/reliability.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from consumer.kafka_source import RECONNECT_BACKOFF_MAX_MS, kafka_options
from rankstream.services import env_lines, kafka_client_options
from rankstream.settings import Settings, load_settings

SECRET = "kafka-pw-6c1f"


def make(**values: object) -> Settings:
    return load_settings(**values)


def test_plaintext_is_the_default() -> None:
    assert kafka_client_options(make()) == {"security_protocol": "PLAINTEXT"}


def test_sasl_plain() -> None:
    options = kafka_client_options(make(kafka_security_protocol="SASL_PLAINTEXT",
                                        kafka_sasl_mechanism="PLAIN",
                                        kafka_sasl_username="crawler",
                                        kafka_sasl_password=SECRET))
    assert options == {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
                       "sasl_plain_username": "crawler", "sasl_plain_password": SECRET}


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_scram_over_tls(mechanism: str, tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    options = kafka_client_options(make(kafka_security_protocol="SASL_SSL",
                                        kafka_sasl_mechanism=mechanism,
                                        kafka_sasl_username="crawler",
                                        kafka_sasl_password=SECRET, kafka_ssl_cafile=ca))
    # kafka-python takes SCRAM credentials in the sasl_plain_* keywords too.
    assert options == {"security_protocol": "SASL_SSL", "sasl_mechanism": mechanism,
                       "sasl_plain_username": "crawler", "sasl_plain_password": SECRET,
                       "ssl_cafile": str(ca)}


def test_tls_only(tmp_path: Path) -> None:
    options = kafka_client_options(make(kafka_security_protocol="SSL",
                                        kafka_ssl_cafile=tmp_path / "ca.pem"))
    assert options == {"security_protocol": "SSL", "ssl_cafile": str(tmp_path / "ca.pem")}


def test_consumer_and_producer_use_the_same_options() -> None:
    settings = make(kafka_bootstrap="a:9093, b:9093", kafka_security_protocol="SASL_SSL",
                    kafka_sasl_mechanism="PLAIN", kafka_sasl_username="u",
                    kafka_sasl_password=SECRET)
    consumer = kafka_options(settings)
    assert consumer.pop("bootstrap_servers") == ["a:9093", "b:9093"]
    assert consumer.pop("reconnect_backoff_max_ms") == RECONNECT_BACKOFF_MAX_MS
    assert consumer == kafka_client_options(settings)


def test_secrets_are_secret_str_and_never_printed() -> None:
    settings = make(kafka_sasl_password=SECRET, redis_password="redis-pw-77aa")
    assert isinstance(settings.kafka_sasl_password, SecretStr)
    assert isinstance(settings.redis_password, SecretStr)
    shown = repr(settings) + str(settings) + "\n".join(env_lines(settings))
    assert SECRET not in shown and "redis-pw-77aa" not in shown
    assert SECRET not in settings.model_dump_json()
