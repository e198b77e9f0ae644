"""dlrover-kfp: resource planning and elastic PS training of DLRM for Kubeflow Pipelines and Airflow."""

__version__ = "0.1.0"
