"""The steps of a scheduled-retraining pipeline: plan, train, evaluate, record, publish.

The Kubeflow Pipelines components (``components/``) and the Airflow operators
(``airflow_plugin/``) are thin wrappers over these functions, so that a pipeline on either
orchestrator does what ``dlrover-kfp plan``, ``run`` and ``record`` do:

* :func:`~dlrover_kfp.steps.plan.plan_step`: Stage 1 (warm start from the history's similar
  jobs, else a cold start); the plan goes to the train step as a document, with a Markdown
  summary for people.
* :func:`~dlrover_kfp.steps.train.train_step`: the elastic run from that plan (Stages 2 and 3
  while it trains) on the local or the Kubernetes backend. It reads the history (the similar
  jobs' measurements) but does not record: that is the record step's, so that a pipeline
  records each run once. A run that fails is recorded here, before the step fails, so that
  nothing is lost.
* :func:`~dlrover_kfp.steps.evaluate.evaluate_step`: the exported ONNX model scores the rows
  the train step held out (onnxruntime, no torch) and must reproduce the train step's AUC.
* :func:`~dlrover_kfp.steps.record.record_step`: the run's profile into the history store;
  recording a run twice is a no-op.
* :func:`~dlrover_kfp.steps.publish.publish_step`: the model copied to the published location
  only when its evaluated AUC is not worse than the last published one's by more than a setting;
  :func:`~dlrover_kfp.steps.score.score_step` scores any rows with a published model.

A job spec is given as a string, the way both orchestrators pass parameters: a path to a YAML
or JSON file, or the YAML document itself (:func:`~dlrover_kfp.steps.spec.load_job_spec`). A
spec that does not validate raises :class:`~dlrover_kfp.errors.SpecError` before anything runs
or is written.

One module per step, and this package imports none of them: the plan and record steps run in
pods of their own and should not pay for importing the trainer (torch), which only
:mod:`~dlrover_kfp.steps.train` needs. Beside the steps, :mod:`~dlrover_kfp.steps.documents`
holds what an orchestrator passes between them (the plan from an XCom, the spec for a job
master elsewhere) and :mod:`~dlrover_kfp.steps.report` the run's HTML report.

This package and the package's public API (``dlrover_kfp.errors``, ``dlrover_kfp.files``,
``dlrover_kfp.history``, the ``dlrover-kfp`` command) are all that ``components/`` and
``airflow_plugin/`` may import: an import-linter contract in pyproject.toml says so.
"""
