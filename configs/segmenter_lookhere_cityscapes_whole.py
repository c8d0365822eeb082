# As segmenter_lookhere_cityscapes.py (trained on 768x768 crops), tested on the whole
# 1024x2048 frame in one pass: a 64x128 patch grid from a 48x48 training grid, the
# extrapolation case. Use it to test a checkpoint trained with the slide config:
#   python tools/test.py configs/segmenter_lookhere_cityscapes_whole.py CKPT
_base_ = ['./segmenter_lookhere_cityscapes.py']
model = dict(test_cfg=dict(_delete_=True, mode='whole'))
