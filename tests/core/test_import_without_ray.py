import subprocess
import sys
import textwrap


def test_core_imports_with_ray_absent():
    # A meta-path finder that refuses `ray` makes it absent for this fresh interpreter.
    code = textwrap.dedent(
        """
        import sys, importlib.abc
        class NoRay(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name == "ray" or name.startswith("ray."):
                    raise ModuleNotFoundError("ray is absent in this test")
        sys.meta_path.insert(0, NoRay())
        import popgrpo.core, popgrpo.algorithms.member, popgrpo.envs.idea, popgrpo.policies.gaussian
        from popgrpo.algorithms.member import Member
        print(Member.__module__)
        print(sorted(m for m in sys.modules if m == "ray" or m.startswith("ray.")))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["popgrpo.algorithms.member", "[]"]  # the member was imported, no ray module
