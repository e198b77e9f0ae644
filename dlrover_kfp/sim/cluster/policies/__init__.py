"""Resource policies the cluster simulator compares, each implementing
:class:`~dlrover_kfp.sim.cluster.api.Policy`, one module per policy:

* ``manual``: the user's request for the whole job (:mod:`.manual`);
* ``optimus``: Optimus (EuroSys 2018), online-fitted speed model and greedy allocation,
  resizing by checkpoint-and-restart (:mod:`.optimus`);
* ``dlrover-oss``: the open-source DLRover heuristics, job master's local optimizer plus the
  cluster brain's history-based warm start and scaling rules (:mod:`.dlrover_oss`);
* ``dlrover-kfp``: this package's own planner (:mod:`.planner`);

and, opt-in, the references ``oracle-<a>`` (``oracle-0.9``, ``oracle-0.7``; :mod:`.oracle`):
handed each job's hidden truth, a bound on what planning can buy, not a peer.

The baselines' thresholds and formulas come from docs/baselines.md.
"""
