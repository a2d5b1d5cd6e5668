"""The one Ray address word the commands take besides a cluster's own address, apart from the code that acts on it.

Planning asks whether a run joins this machine's Ray (its parts are then sized for this machine's CPUs) without
importing what finds and joins that Ray (:mod:`.running_ray`), whose messages name the ``--address`` flag of the
commands that have one.
"""

from __future__ import annotations

#: The address that asks for the Ray ``ray start`` left running on this machine (:func:`.running_ray.find_local_ray`).
AUTO = "auto"
