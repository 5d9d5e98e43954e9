"""The models: which ones run without a download (`local.py`), the hub's pull and rm (`hub.py`),
what a model needs and whether it fits (`memory.py`), doctor's checks of one (`check.py`,
`template_check.py`), and the pool that loads and unloads them for serve and chat (`pool.py`,
what it may load: `catalog.py`; docs/models.md). ``serve`` and ``chat`` both run their models
through a ``ModelPool``; neither knows the other's wire format, so a refusal is a
``ModelRefused`` each front end shows its own way."""
