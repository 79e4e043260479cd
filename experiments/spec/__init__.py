"""The paper's specification: its published numbers and claims, the profiles (scales), the tuned values a profile
carries, and the grids of runs behind each figure and table."""
