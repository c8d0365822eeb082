# Segmenter, linear decoder, LookHere ViT-B/16, Cityscapes 768x768, 80k; slide test.
_base_ = ['./segmenter_lookhere_cityscapes.py']
model = dict(
    decode_head=dict(
        _delete_=True,
        type='FCNHead',
        in_channels=768,
        channels=768,
        num_convs=0,
        dropout_ratio=0.0,
        concat_input=False,
        num_classes=19,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
    )
)
