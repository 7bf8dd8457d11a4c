"""Entry points that run inside a Ray job (``python -m popgrpo.jobs.train``)."""
