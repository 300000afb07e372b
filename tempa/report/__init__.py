"""The HTML report of `tempa report`: one self-contained page (render.page), inline SVG
charts (svg.py), inline CSS and script (style.py)."""
