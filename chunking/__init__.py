"""Key ranges and chunk planning: pure Python, no Spark, no Airflow."""
