"""What `pulumi up` runs: the Pulumi program (``program``), the ``InferencePlatform`` component it creates
(``platform``), and the same program run offline under Pulumi's mocks for `inferstack plan` and the policy pack
(``synthesis``)."""
