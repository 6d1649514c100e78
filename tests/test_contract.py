"""The boundary with the user's code: one line naming the component, the place, the problem."""

from __future__ import annotations

import pickle

import pytest
import torch

from rayfl.contract import ComponentError, calling, describe, expect, name_of


class UserThing:
    def method(self):
        return {}["missing"]


def test_an_exception_in_user_code_names_the_component_round_client_and_keeps_its_frames():
    with pytest.raises(ComponentError) as info:
        with calling(name_of(UserThing, "method"), round=2, client=7):
            UserThing().method()
    e = info.value
    assert str(e) == ("tests.test_contract:UserThing.method (round 3, client 7): raised "
                      "KeyError: 'missing'")
    assert "test_contract.py" in e.frames and "return {}[\"missing\"]" in e.frames
    assert "rayfl/contract.py" not in e.frames  # the user's frames only


def test_a_broken_contract_gets_the_place_filled_in_and_survives_pickling():
    with pytest.raises(ComponentError) as info:
        with calling("m:X.f", round=0):
            expect(False, "m:X.f", "returned a str, not a tensor", client=3)
    e = pickle.loads(pickle.dumps(info.value))  # it crosses Ray's object store
    assert str(e) == "m:X.f (round 1, client 3): returned a str, not a tensor"


def test_names_and_descriptions():
    assert name_of(UserThing().method) == "tests.test_contract:UserThing.method"
    assert name_of(UserThing()) == "tests.test_contract:UserThing"
    assert describe(torch.zeros(3, dtype=torch.int64)) == "an int64 tensor of shape (3,)"
    assert describe("x") == "a str" and describe(1) == "an int" and describe(None) == "None"
    assert describe([1, 2]) == "a list of 2"
