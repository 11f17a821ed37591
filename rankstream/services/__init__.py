"""Real local services for developers, the demo and CI: Kafka 4.x (KRaft) and redis-server.

``python -m rankstream.services up`` starts what is missing and reuses what already
answers; tests call :func:`up` directly. Fault-injection tests get handles from
:func:`local_services` and act on them::

    svc = local_services(settings)
    restart_redis(svc.redis)
    with frozen_redis(svc.redis):
        ...
    restart_kafka(svc.kafka)
"""

from rankstream.services.kafka import (
    KafkaBroker,
    TopicSpec,
    delete_topics,
    ensure_topics,
    kafka_answers,
    kafka_pid,
    kill_kafka,
    restart_kafka,
    start_kafka,
    stop_kafka,
    topic_partitions,
)
from rankstream.services.kafka_jars import KAFKA_VERSION, fetch_kafka
from rankstream.services.redis import (
    AclUser,
    RedisServer,
    auth_redis,
    freeze_redis,
    frozen_redis,
    kill_redis,
    redis_answers,
    redis_pid,
    restart_redis,
    start_redis,
    stop_redis,
    thaw_redis,
)
from rankstream.services.stack import (
    LocalServices,
    ServiceState,
    down,
    ensure_settings_topics,
    env_lines,
    kafka_client_options,
    local_services,
    status,
    topic_specs,
    up,
)

__all__ = [
    "KAFKA_VERSION",
    "AclUser",
    "KafkaBroker",
    "LocalServices",
    "RedisServer",
    "ServiceState",
    "TopicSpec",
    "auth_redis",
    "delete_topics",
    "down",
    "ensure_settings_topics",
    "ensure_topics",
    "env_lines",
    "fetch_kafka",
    "freeze_redis",
    "frozen_redis",
    "kafka_answers",
    "kafka_client_options",
    "kafka_pid",
    "kill_kafka",
    "kill_redis",
    "local_services",
    "redis_answers",
    "redis_pid",
    "restart_kafka",
    "restart_redis",
    "start_kafka",
    "start_redis",
    "status",
    "stop_kafka",
    "stop_redis",
    "thaw_redis",
    "topic_partitions",
    "topic_specs",
    "up",
]
