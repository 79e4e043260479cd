"""Training a whole profile before its notebooks read it: the plan of its runs, and executors that train them one after another, side by side on one machine, or across a Slurm cluster."""
