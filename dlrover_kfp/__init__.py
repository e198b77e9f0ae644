"""dlrover-kfp: resource planning and elastic PS training of DLRM for KFP and Airflow."""

__version__ = "0.1.0"
