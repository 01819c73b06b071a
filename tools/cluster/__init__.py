"""Running a recipe on a cluster: a Ray head, workers and jobs (ray_cluster, scripts/), Slurm and KubeRay
templates (templates)."""
