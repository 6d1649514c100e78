"""rayfl.deferred: a heavy module loads at its first use, so that the processes a run starts —
the client actors, the server — do not load what they never use."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rayfl.deferred import deferred

HEAVY = ("matplotlib", "scipy", "dp_accounting")


def test_importing_rayfl_its_client_actor_and_its_server_loads_no_plotting_or_accounting():
    code = ("import sys, rayfl, rayfl.runtime.client_actor, rayfl.runtime.server; "
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_a_deferred_module_loads_when_a_name_of_it_is_first_read(tmp_path, monkeypatch):
    (tmp_path / "rayfl_probe_module.py").write_text("VALUE = 41 + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "rayfl_probe_module", raising=False)
    module = deferred("rayfl_probe_module")
    assert "rayfl_probe_module" not in sys.modules
    assert module.VALUE == 42 and "rayfl_probe_module" in sys.modules
    assert module.VALUE is sys.modules["rayfl_probe_module"].VALUE
    with pytest.raises(AttributeError, match="MISSING"):
        module.MISSING  # noqa: B018 - the read is the test
    monkeypatch.delitem(sys.modules, "rayfl_probe_module")


def test_a_deferred_module_that_does_not_exist_fails_at_its_first_read():
    module = deferred("rayfl_no_such_module")
    with pytest.raises(ModuleNotFoundError, match="rayfl_no_such_module"):
        module.anything  # noqa: B018 - the read is the test


def test_a_function_reading_a_deferred_module_pickles_as_ray_sends_it():
    from ray import cloudpickle

    json_module = deferred("json")
    back = cloudpickle.loads(cloudpickle.dumps(lambda: json_module.dumps([1])))
    assert back() == "[1]"
