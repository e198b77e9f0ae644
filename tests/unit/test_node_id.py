"""A node's three spellings (pod name, master key, lease holder) read back as the node they
were written from, for any job name Kubernetes accepts, and nothing else reads as a node."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover_kfp.core.node_id import NodeId

# A job name as the spec allows it: a DNS-1123 label start, hyphens inside (job names such as
# "ctr-ps" or "worker-1" share their shape with the suffixes, on purpose).
jobs = st.from_regex(r"[a-z]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)
nodes = st.builds(
    NodeId,
    role=st.sampled_from(["worker", "ps"]),
    index=st.integers(0, 10_000),
    generation=st.integers(0, 1_000),
)


@given(job=jobs, node=nodes)
def test_a_pod_name_reads_back_as_its_node(job: str, node: NodeId) -> None:
    assert NodeId.from_pod_name(job, node.pod_name(job)) == node


@given(node=nodes, token=st.from_regex(r"[0-9a-f-]{1,24}", fullmatch=True))
def test_a_key_and_a_lease_holder_read_back_without_the_generation(
    node: NodeId, token: str
) -> None:
    bare = NodeId(node.role, node.index)
    assert NodeId.from_key(node.key) == bare
    assert NodeId.from_holder(node.holder(token)) == bare
    assert NodeId.from_holder(node.key) == bare  # a worker that sent no incarnation


def test_the_spellings() -> None:
    assert NodeId("ps", 1, 2).pod_name("ctr") == "ctr-ps-1-g2"
    assert NodeId.worker(3).pod_name("ctr") == "ctr-worker-3"
    assert NodeId.worker(3).holder("77-ab") == "worker-3#77-ab"


@pytest.mark.parametrize(
    "name",
    [
        "other-worker-1",  # another job's pod
        "ctr-worker-1-g0",  # generation 0 is never spelled
        "ctr-worker-x",
        "ctr-chief-0",
        "ctr-ps-1-g2-extra",
        "ctr-ps--1",
        "ctr",
    ],
)
def test_a_name_that_is_no_pod_of_the_job_is_none(name: str) -> None:
    assert NodeId.from_pod_name("ctr", name) is None


@pytest.mark.parametrize(
    "key", ["worker", "worker-", "ps-1-g2", "chief-0", "worker-01x", "worker-01", ""]
)
def test_a_key_that_is_no_node_is_none(key: str) -> None:
    assert NodeId.from_key(key) is None


def test_a_node_with_a_bad_role_or_index_is_refused() -> None:
    with pytest.raises(ValueError, match="role"):
        NodeId("chief", 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=">= 0"):
        NodeId("worker", -1)
