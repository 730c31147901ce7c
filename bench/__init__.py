"""kvpool's benchmark harness and chaos driver.

Not part of the installed package: it ships with the source checkout only. Run its modules
from the checkout's root (``python -m bench.placement_scale``, ``python -m bench.chaos_failover``)
or through ``kvpool bench``, which finds the checkout of an editable install.
"""
