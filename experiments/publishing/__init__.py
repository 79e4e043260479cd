"""What the reader sees: the report's catalogue and HTML pages, LaTeX in HTML, and the generated blocks of the README
and of ``docs/*.md``."""
