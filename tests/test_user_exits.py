"""A user's component that calls sys.exit, or raises KeyboardInterrupt itself, is that
component's error; a real Ctrl-C stays a Ctrl-C.

Either would otherwise end the run with no summary and the exit status the component chose (0
for sys.exit(0), 3 — a diverged run's — for sys.exit(3)), or pass for a Ctrl-C with resume
advice (in process) or a cancelled Ray task. Now it is one line naming the component, exit 2,
the same in process and on Ray actors; a run that ends without a summary never exits 0.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from rayfl.cli import main
from rayfl.contract import ComponentError, calling, own_exits, signals_watched
from tests.conftest import TINY

BAD = "tests.components_bad"
NO_END = "a component does not end the run: raise an exception saying what went wrong"


@pytest.fixture(autouse=True)
def ctrl_c_raises():
    """Python's own SIGINT handler during each test, whatever the shell that started the suite
    set (a background job's SIGINT is ignored, so a Ctrl-C would never arrive)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture
def cli(tmp_path, capsys, cache):
    """``cli(executor, *overrides)`` -> (exit status, stdout lines, stderr lines) of a run of
    the tiny config on that executor, its runs under tmp_path."""
    def call(executor, *overrides):
        code = main(["run", TINY, f"output_dir={tmp_path / 'runs'}", f"data.cache_dir={cache}",
                     f"runtime.executor={executor}", "--quiet", *overrides])
        out = capsys.readouterr()
        return code, out.out.splitlines(), out.err.splitlines()

    return call


def _component_error(err: list[str], *phrases: str) -> None:
    assert err and err[0].startswith("rayfl: error: "), err
    for phrase in phrases:
        assert phrase in err[0], err[0]
    for line in err[1:]:  # the user's own frames only
        assert (line.startswith('  File "') and "components_bad.py" in line) or \
            line.startswith("    "), line
    assert not any(w in " ".join(err) for w in ("Traceback", "resume", "Cancelled")), err


CASES = {
    "sys.exit(0) in round 2": (
        [f"algorithm.name={BAD}:ExitsInRoundTwo"],
        f"{BAD}:ExitsInRoundTwo.client_train (round 2, client ",
        f"raised SystemExit(0) (sys.exit); {NO_END}"),
    "KeyboardInterrupt in round 2": (
        [f"algorithm.name={BAD}:InterruptsInRoundTwo"],
        f"{BAD}:InterruptsInRoundTwo.client_train (round 2, client ",
        "raised KeyboardInterrupt, though no Ctrl-C came"),
    "a selector's KeyboardInterrupt": (
        [f"selection.name={BAD}:SelectorInterrupts"],
        f"{BAD}:SelectorInterrupts.select (round 2): raised KeyboardInterrupt"),
    "sys.exit(0) in an evaluation forward": (
        [f"model.name={BAD}:ExitsWhenEvaluated"],
        f"{BAD}:ExitsWhenEvaluated.forward: raised SystemExit(0) (sys.exit)"),
    "KeyboardInterrupt in an evaluation forward": (
        [f"model.name={BAD}:InterruptsWhenEvaluated"],
        f"{BAD}:InterruptsWhenEvaluated.forward: raised KeyboardInterrupt, though no Ctrl-C"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_components_exit_is_its_error_in_process(case, cli, tmp_path):
    overrides, *phrases = CASES[case]
    code, out, err = cli("inprocess", *overrides)
    assert code == 2, err
    _component_error(err, *phrases)
    assert not any(line.startswith(("done:", "stopped:")) for line in out)
    # past the pre-flight: a run stopped in round 2 keeps round 1; one stopped in round 1's
    # evaluation recorded nothing and leaves nothing
    assert (tmp_path / "runs").exists() == ("round 2" in case or "selector" in case)


@pytest.mark.parametrize("case", list(CASES))
def test_a_components_exit_is_its_error_on_ray_actors(case, cli, ray_local):
    overrides, *phrases = CASES[case]
    code, out, err = cli("ray", *overrides)
    assert code == 2, err  # in a client actor, or the server actor (an evaluation)
    _component_error(err, *phrases)
    assert not any(line.startswith(("done:", "stopped:")) for line in out)


@pytest.mark.parametrize("overrides, says", [
    ([f"algorithm.name={BAD}:ExitsThree"],
     f"{BAD}:ExitsThree.client_train (round 1, client 10): raised SystemExit(3) (sys.exit)"),
    ([f"data.dataset={BAD}:ExitsWhileLoading"],
     f"{BAD}:ExitsWhileLoading.load: raised SystemExit(0) (sys.exit)"),
], ids=["sys.exit(3) in pre-flight", "SystemExit(0) in a dataset's load"])
def test_an_exit_before_the_run_is_refused_before_anything_is_written(overrides, says, cli,
                                                                       tmp_path, no_ray):
    code, _, err = cli("inprocess", *overrides)
    assert code == 2, err  # not 3, a diverged run's status; not 0
    _component_error(err, says, NO_END)
    assert not (tmp_path / "runs").exists()


def test_a_real_ctrl_c_in_user_code_stays_a_ctrl_c(cli):
    code, _, err = cli("inprocess", f"algorithm.name={BAD}:CtrlCInRoundTwo")
    assert code == 130
    assert len(err) == 1 and err[0].startswith("interrupted; continue with: rayfl resume "), err


# ----- the contract's own rules -------------------------------------------------------------------
def _interrupt_myself():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)  # the handler raises KeyboardInterrupt long before


def test_calling_tells_a_signal_from_a_raised_keyboard_interrupt():
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(ComponentError, match="raised KeyboardInterrupt, though no Ctrl-C"):
        with signals_watched(), calling("m:A.f"):
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        with signals_watched(), calling("m:A.f"):
            _interrupt_myself()
    assert signal.getsignal(signal.SIGINT) is handler  # put back


def test_own_exits_names_the_users_function_and_passes_a_ctrl_c():
    def leave():
        sys.exit(0)

    with pytest.raises(ComponentError) as info:
        with own_exits():
            leave()
    assert str(info.value) == (f"{__name__}:test_own_exits_names_the_users_function_and_passes_"
                               f"a_ctrl_c.<locals>.leave: raised SystemExit(0) (sys.exit); "
                               f"{NO_END}")
    with pytest.raises(KeyboardInterrupt):
        with own_exits():
            _interrupt_myself()


def test_a_frame_of_a_compiled_extension_is_not_the_users():
    """Ray's Cython frames name their files relative to its build: a SIGTERM that interrupts
    ``ray.wait`` is an interruption, not a KeyboardInterrupt of the user's code."""
    from rayfl.contract import _is_user_frame

    assert not _is_user_frame("python/ray/_raylet.pyx")
    assert not _is_user_frame(os.path.join(os.path.dirname(sys.modules["rayfl"].__file__),
                                           "cli.py"))
    assert _is_user_frame(__file__)
