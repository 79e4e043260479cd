"""The paper's specification: its published numbers and claims, the profiles (scales) and the grids of runs behind each figure and table."""
