"""Roles of a parameter-server job: parsed and checked before any Spark job, numbered in
a fixed order, and written into every rank's TF_CONFIG."""

from __future__ import annotations

import pytest
from helpers import refused_by_sparkdist_run

import sparkdist
from sparkdist.backends.tensorflow import roles_tf_config
from sparkdist.roles import Roles, rank_role


def test_ranks_take_roles_in_order():
    roles = Roles.parse("chief=1, worker=2, ps=2")
    assert [roles.role_of(r) for r in range(5)] == [
        ("chief", 0),
        ("worker", 0),
        ("worker", 1),
        ("ps", 0),
        ("ps", 1),
    ]
    assert Roles.from_env(roles.to_env()) == roles
    assert rank_role({**roles.to_env(), "RANK": "3"}) == ("ps", 0)
    assert rank_role({"RANK": "3"}) is None


def test_tf_config_lists_every_role():
    roles = Roles.parse({"chief": 1, "worker": 2, "ps": 1})
    addresses = ["h0:1", "h1:2", "h2:3", "h3:4"]
    assert roles_tf_config(addresses, roles, 2) == {
        "cluster": {"chief": ["h0:1"], "worker": ["h1:2", "h2:3"], "ps": ["h3:4"]},
        "task": {"type": "worker", "index": 1},
    }


@pytest.mark.parametrize(
    ("np", "roles", "message"),
    [
        (3, {"chief": 1, "worker": 2}, "no 'ps' role"),
        (2, {"chief": 1, "ps": 1}, "no 'worker' role"),
        (4, {"chief": 2, "worker": 1, "ps": 1}, "exactly one chief"),
        (5, {"chief": 1, "worker": 2, "ps": 1}, "roles add up to 4 ranks"),
        (4, {"chief": 1, "worker": 2, "evaluator": 1}, "unknown role(s) ['evaluator']"),
        (4, {"chief": 1, "worker": -1, "ps": 1}, "must be an int >= 0"),
        (4, "chief=1,worker,ps=1", "expected ROLE=COUNT"),
    ],
)
def test_bad_roles_are_refused_by_the_runner(np, roles, message):
    with pytest.raises(ValueError) as err:
        sparkdist.HorovodRunner(np=np, roles=roles)
    assert message in str(err.value)


def test_bad_roles_are_refused_by_the_command_before_spark_starts(tmp_path):
    stderr = refused_by_sparkdist_run(tmp_path, "--np", "3", "--roles", "chief=1,worker=2")
    assert "no 'ps' role" in stderr
