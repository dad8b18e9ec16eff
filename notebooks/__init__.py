"""The project's notebooks and the helpers they import (support.py)."""
