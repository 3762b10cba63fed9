"""`python -m gg_runtime`: print the build and the current device's support."""
import json

from .info import info

print(json.dumps(info(), indent=2, default=str))
