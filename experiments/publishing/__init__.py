"""What the reader sees: the report's catalogue and HTML pages, LaTeX in HTML, and the README's generated blocks."""
