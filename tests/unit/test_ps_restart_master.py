"""The master's side of a PS restarted inside its pod (training/supervisor.py), without processes.

A PS whose process ends drops its connection to the master (``ps_lost``); its restarted process
asks for its configuration saying it is a restart, and is held (``restarting``) until the
master has rolled the job back (``restart_released``); it registers again, saying where it
restored from.
"""

from __future__ import annotations

from dlrover_kfp.runtime.master import MasterService
from dlrover_kfp.training.master_protocol import CONFIG, REGISTER
from dlrover_kfp.training.wire import PeerInfo
from tests.unit.test_master_service import call, make_service


def _registered(service: MasterService, index: int, port: int) -> PeerInfo:
    peer = PeerInfo(id=100 + index, address=("127.0.0.1", 50_000 + index))
    call(service, peer, REGISTER, index=index, generation=0, address=["127.0.0.1", port])
    return peer


def test_a_registered_ps_whose_connection_drops_is_lost_once_with_the_time() -> None:
    service, clock = make_service(num_ps=2)
    ps0, old_ps1 = _registered(service, 0, 7000), _registered(service, 1, 7001)
    clock.now = 12.5
    service.on_disconnect(ps0)
    clock.now = 13.0
    service.on_disconnect(ps0)
    assert service.state.lost_ps() == {0: 12.5}
    # ps-1 registered again since (a new process, a new address): its predecessor's drop is
    # no news.
    _registered(service, 1, 7002)
    service.on_disconnect(old_ps1)
    assert service.state.lost_ps() == {0: 12.5}
    # A change of the PS set replaced ps-0 after its process went: no longer the set's loss.
    service.state.ps_addresses[0] = ("127.0.0.1", 7500)
    assert service.state.lost_ps() == {}


def test_a_restarted_ps_waits_until_released_then_gets_the_rollback_configuration() -> None:
    service, _ = make_service(num_ps=2)
    state = service.state
    service.on_disconnect(_registered(service, 0, 7000))  # it served, then its process died
    peer = PeerInfo(id=1, address=("127.0.0.1", 1))
    meta = {"role": "ps", "index": 0, "generation": 0, "restart": 1, "cause": "signal 9"}
    assert call(service, peer, CONFIG, **meta).meta == {"wait": True}
    assert state.restarting == {0: "signal 9"}
    state.job_config["restore"] = True
    state.job_config["restore_choice"] = {"step": 40}
    state.restart_released = True
    reply = call(service, peer, CONFIG, **meta).meta
    assert reply["restore"] is True and reply["restore_choice"] == {"step": 40}


def test_a_restarted_ps_of_an_older_generation_registers_and_says_where_it_restored() -> None:
    """A PS a live change kept was started with an older generation than the set's."""
    service, _ = make_service(num_ps=2)
    state = service.state
    state.generation = 2
    peer = PeerInfo(id=1, address=("127.0.0.1", 1))
    meta = {"role": "ps", "index": 1, "generation": 0, "restart": 1, "cause": "asked"}
    call(service, peer, CONFIG, **meta)
    call(
        service,
        peer,
        REGISTER,
        index=1,
        generation=0,
        address=["127.0.0.1", 7100],
        restored="memory",
    )
    assert state.ps_addresses[1] == ("127.0.0.1", 7100)
    assert state.restored_from == {1: "memory"}


def test_a_ps_restarted_before_it_ever_served_starts_as_any_ps_does() -> None:
    """Nothing was trained on it: no rollback to wait for (the training loop, which would
    release it, has not begun)."""
    service, _ = make_service(num_ps=2)
    peer = PeerInfo(id=1, address=("127.0.0.1", 1))
    meta = {"role": "ps", "index": 1, "generation": 0, "restart": 1, "cause": "signal 9"}
    reply = call(service, peer, CONFIG, **meta).meta
    assert "wait" not in reply and reply["generation"] == 0
    assert service.state.restarting == {}
