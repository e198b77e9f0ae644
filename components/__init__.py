"""Kubeflow Pipelines components of dlrover-kfp, and their compiled YAML.

``elastic_dlrm.py`` defines the components ``plan_resources``, ``elastic_train`` and
``record_profile`` and the pipeline ``elastic_dlrm_pipeline`` (plan -> train -> record), and
``prepare_example_data`` and ``publish_model`` (the publish gate);
``glue.py`` is what their bodies run. The compiled YAML beside them is what users load
(``kfp.components.load_component_from_file``) or submit; ``dlrover-kfp compile`` regenerates
it, and a test fails when it is stale.
"""
