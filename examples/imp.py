import json
import decimal

try:
    import yaml
except ImportError:
    pass
