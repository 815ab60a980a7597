"""Scale-out on one machine: N service instances sharing one Redis, Celery workers, and nginx
in front, started and stopped as one unit (``chunlian cluster``).

``nginx`` renders the nginx config from the shipped template, ``spec`` says what to start
and what each process gets, ``launcher`` starts and stops the processes, ``cli`` adds the
``chunlian cluster`` command. See docs/guides/deploy.md for the same topology across
machines.
"""

from __future__ import annotations

from chunlian.cluster.launcher import Cluster, ClusterSpec
from chunlian.cluster.nginx import ClusterError, NginxConfig, render

__all__ = ["Cluster", "ClusterError", "ClusterSpec", "NginxConfig", "render"]
