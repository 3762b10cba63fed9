"""Every kernel family the wheel contains, by name: each module of this folder
describes one family in its FAMILY.  Adding a module adds the family."""
import importlib
import pkgutil

FAMILIES = {}
for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    _family = importlib.import_module(f"{__name__}.{_module}").FAMILY
    FAMILIES[_family.name] = _family
