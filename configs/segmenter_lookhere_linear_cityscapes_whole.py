# As segmenter_lookhere_linear_cityscapes.py, tested on the whole 1024x2048 frame.
_base_ = ['./segmenter_lookhere_linear_cityscapes.py']
model = dict(test_cfg=dict(_delete_=True, mode='whole'))
