"""Bulk jobs: thousands of couplets per request, on Celery + Redis or in-process.

``store`` (job state, first-write-wins results), ``items`` (validation, specs, result
entries), ``backend`` (what the API calls: ``CeleryJobs`` or ``InProcessJobs``),
``celery_app`` and ``tasks`` (the worker), ``worker`` (one chunk, Celery-free), ``cli``
(``chunlian jobs submit`` and ``chunlian worker``). See docs/guides/bulk-jobs.md.
"""
