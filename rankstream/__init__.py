"""rankstream: streaming link analysis with certified error bounds.

The packages split the work:

* :mod:`ranker` is the math (numpy/scipy/numba, no I/O);
* :mod:`producer` holds the event schema and the publishing side;
* :mod:`consumer` is the service: Kafka in, Redis graph and scores out;
* :mod:`rankstream` (this package) holds what they share: the exception root
  (exported here), the settings object (``rankstream.settings.Settings`` and
  ``load_settings``: not imported here, because pydantic-settings takes ~0.16 s to
  import and code that only needs the exceptions, ``ranker`` first, should not pay
  for it; the command line reads the settings once, for every command), the command
  line and the
  local-services script (:mod:`rankstream.services`).
"""

from rankstream.errors import (
    ConfigError,
    ConvergenceError,
    InputError,
    RankstreamError,
    ServiceError,
    ServiceUnavailable,
)

__all__ = [
    "ConfigError",
    "ConvergenceError",
    "InputError",
    "RankstreamError",
    "ServiceError",
    "ServiceUnavailable",
]
__version__ = "0.1.0"
