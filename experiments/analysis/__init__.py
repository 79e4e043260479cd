"""From records to results: seeds' means and intervals, the claims' verdicts, the analytic items, plots, timings and what a profile costs."""
