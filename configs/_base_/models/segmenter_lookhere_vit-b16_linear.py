# Segmenter with a linear decoder (a 1x1 conv on the last LookHere ViT-B/16 map), the
# decoder the LookHere paper fine-tunes with ("following the Segmenter protocol").
_base_ = ['./segmenter_lookhere_vit-b16_mask.py']
model = dict(
    decode_head=dict(
        _delete_=True,
        type='FCNHead',
        in_channels=768,
        channels=768,
        num_convs=0,
        dropout_ratio=0.0,
        concat_input=False,
        num_classes=150,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0)))
