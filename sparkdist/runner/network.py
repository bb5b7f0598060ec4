"""Kept so that `sparkdist.runner.network` imports go on working: the network helpers
moved to `sparkdist.network`, where the backends use them too."""

from sparkdist.network import (  # noqa: F401
    address_of_interface,
    interface_of,
    is_local_address,
    reserve_port,
    resolve,
)
