"""Terraform runtime: Kusion-form ``Terraform`` resources driven through the OpenTofu CLI."""

from runtimes.terraform.runtime import TerraformRuntime, strip_reserved
from runtimes.terraform.state import RESERVED_KEYS, SENSITIVE_KEY, STATE_KEY

__all__ = ["RESERVED_KEYS", "SENSITIVE_KEY", "STATE_KEY", "TerraformRuntime", "strip_reserved"]
