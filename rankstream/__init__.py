"""rankstream: streaming link analysis with certified error bounds.

The packages split the work:

* :mod:`ranker` is the math (numpy/scipy/numba, no I/O);
* :mod:`producer` holds the event schema and the publishing side;
* :mod:`consumer` is the service: Kafka in, Redis graph and scores out;
* :mod:`rankstream` (this package) holds what they share: the exception root,
  the settings object, the command line and the local-services script.
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
