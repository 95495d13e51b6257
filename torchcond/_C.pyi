# torchcond._C defines no Python names: loading it registers the torchcond operator
# library (torch.ops.torchcond.*) with the dispatcher. torchcond/fused_select.py
# holds the typed Python entry points.
