"""The research tools built on the training service: the pre-registered studies and their
reports (:mod:`popgrpo.research.study`) and the scheduler simulator
(:mod:`popgrpo.research.sim`).

Nothing in the training service imports from here (tests/test_import_graph.py); a study runs
training through the same ``popgrpo.train`` and executors a user's run does.
"""
