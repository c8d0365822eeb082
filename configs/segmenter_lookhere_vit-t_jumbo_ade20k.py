# Segmenter, mask decoder, LookHere ViT-T/16 + Jumbo (Fuller et al. 2025, "Thicker and
# Quicker"), ADE20K 512x512: the ViT-T config with J = 6 Jumbo tokens in place of the CLS
# token (the paper's 6x-wide global token: 6 x 192 = 1152 channels), i.e. after every
# block's attention the six tokens go side by side through ONE 1152 -> 4608 -> 1152 MLP
# shared by all 12 blocks. Trains from scratch (no Jumbo weights for this trunk).
# The optimizer is the ViT-T config's (plain SGD); with
# constructor='LookHereLayerDecayOptimizerConstructor' the wide MLP gets layer-decay groups
# of its own (jumbo_mlp_*, lookhere_dense/engine/layer_decay.py).
_base_ = ['./segmenter_lookhere_vit-t_ade20k.py']
model = dict(backbone=dict(with_cls_token=False, jumbo_tokens=6))
