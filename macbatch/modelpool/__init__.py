"""Many models, one app: which models a front end may run, which are loaded, when each loads and
unloads, and how their engines share the device (docs/models.md). ``serve`` and ``chat`` both
run their models through a ``ModelPool``; neither knows the other's wire format, so a refusal is
a ``ModelRefused`` each front end shows its own way."""
