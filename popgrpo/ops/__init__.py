"""Operating popgrpo on a cluster: Ray Jobs submission, Grafana dashboards, a local Prometheus (``monitor``).

Each module registers its own ``popgrpo`` sub-commands through ``add_parsers(sub)``.
"""
