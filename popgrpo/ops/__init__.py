"""Operating popgrpo on a cluster: Ray Jobs submission, Grafana dashboards.

Each module registers its own ``popgrpo`` sub-commands through ``add_parsers(sub)``.
"""
