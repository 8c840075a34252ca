"""How a secret reads wherever its value is not at hand.

`inferstack plan` passes this for every secret config value and shows it for every secret input; the
policy pack reads Pulumi secrets as this; the gateway knows that an API-keys value of exactly this is the
plan's placeholder, not keys. One string, so all three agree.
"""

from __future__ import annotations

REDACTED = "[secret]"
