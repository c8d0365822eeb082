# Segmenter with a linear decoder on LookHere ViT-B/16, ADE20K 512x512, 160k iterations
# (the LookHere paper's segmentation protocol). Same recipe and weights rules as
# segmenter_lookhere_ade20k.py.
_base_ = ['./segmenter_lookhere_ade20k.py']
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
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
    )
)
