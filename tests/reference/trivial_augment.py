"""trivial_augment.py: writes tests/unit/trivial_reference.h, torchvision's
TrivialAugmentWide operations (autoaugment._apply_op, on uint8 tensors, as the
transform makes them) on two small images, RGB and grey, at magnitudes of its table of
31 bins, for tests/unit/augment.c to hold ddp_trivial_apply and ddp_trivial_magnitude
to, and hashes of the same on two larger images. Run with a Python that has torchvision:
    python3 tests/reference/trivial_augment.py > tests/unit/trivial_reference.h
"""
import torch
import torchvision
from torchvision.transforms import InterpolationMode
from torchvision.transforms.autoaugment import TrivialAugmentWide, _apply_op

H, W = 7, 6
generator = torch.Generator().manual_seed(3)
rgb = torch.randint(0, 256, (3, H, W), dtype=torch.uint8, generator=generator)
rgb[:, 0, 0] = torch.tensor([0, 0, 0])  # a black and a white pixel, and a grey one
rgb[:, 1, 1] = torch.tensor([255, 255, 255])
rgb[:, 2, 3] = torch.tensor([77, 77, 77])
grey = torch.randint(20, 200, (1, H, W), dtype=torch.uint8, generator=generator)

space = TrivialAugmentWide()._augmentation_space(31)
names = list(space.keys())
enums = ["DDP_TRIVIAL_IDENTITY", "DDP_TRIVIAL_SHEAR_X", "DDP_TRIVIAL_SHEAR_Y", "DDP_TRIVIAL_TRANSLATE_X",
         "DDP_TRIVIAL_TRANSLATE_Y", "DDP_TRIVIAL_ROTATE", "DDP_TRIVIAL_BRIGHTNESS", "DDP_TRIVIAL_COLOR",
         "DDP_TRIVIAL_CONTRAST", "DDP_TRIVIAL_SHARPNESS", "DDP_TRIVIAL_POSTERIZE", "DDP_TRIVIAL_SOLARIZE",
         "DDP_TRIVIAL_AUTOCONTRAST", "DDP_TRIVIAL_EQUALIZE"]
GEOMETRIC = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"}

cases = []  # (image name, op name, bin, sign, bilinear)
for name in names:
    magnitudes, signed = space[name]
    bins = [0] if magnitudes.ndim == 0 else [3, 10, 17, 30]
    for k in bins:
        for sign in ([1, -1] if signed else [1]):
            for bilinear in ([False, True] if name in GEOMETRIC else [False]):
                cases.append(("rgb", name, k, sign, bilinear))
for name, k, sign in [("Contrast", 12, 1), ("Sharpness", 25, -1), ("Equalize", 0, 1), ("AutoContrast", 0, 1),
                      ("Rotate", 20, 1), ("Color", 30, 1), ("Brightness", 30, 1), ("Posterize", 28, 1)]:
    cases.append(("grey", name, k, sign, False))


def magnitude(name, k, sign):
    magnitudes, _ = space[name]
    return sign * (float(magnitudes[k].item()) if magnitudes.ndim > 0 else 0.0)


def values(image):  # [c, h, w] as the runtime holds it, [h, w, c]
    return image.permute(1, 2, 0).reshape(-1).tolist()


def numbers(xs, per=18):
    return ",\n      ".join(", ".join(str(x) for x in xs[i:i + per]) for i in range(0, len(xs), per))


print("/* Made by tests/reference/trivial_augment.py from torchvision %s: do not edit. */"
      % torchvision.__version__)
print("enum { TRIVIAL_H = %d, TRIVIAL_W = %d };" % (H, W))
print("static const unsigned char trivial_rgb[TRIVIAL_H * TRIVIAL_W * 3] = {\n      %s};" % numbers(values(rgb)))
print("static const unsigned char trivial_grey[TRIVIAL_H * TRIVIAL_W] = {\n      %s};" % numbers(values(grey)))
print("typedef struct TrivialCase {\n    int channels, op, bin, sign;\n    bool bilinear;\n    double magnitude;\n"
      "    unsigned char expect[TRIVIAL_H * TRIVIAL_W * 3];\n} TrivialCase;")
print("static const TrivialCase trivial_cases[] = {")
for image_name, name, k, sign, bilinear in cases:
    image = rgb if image_name == "rgb" else grey
    m = magnitude(name, k, sign)
    mode = InterpolationMode.BILINEAR if bilinear else InterpolationMode.NEAREST
    out = _apply_op(image.clone(), name, m, interpolation=mode, fill=None)
    print("    {%d, %s, %d, %d, %s, %r,\n     {%s}}," % (image.shape[0], enums[names.index(name)], k, sign,
                                                       "true" if bilinear else "false", m, numbers(values(out))))
print("};")

# Larger images, of 32 x 32 and 17 x 23 pixels (past the size where torch's affine grid
# is a BLAS product), every operation at four bins, both signs and both resamplings:
# the FNV-1a hash of each result's bytes. Their inputs are a pattern the C test makes
# too: byte (y * W + x) * 3 + c is ((that index) * 7919 + 13) % 251.


def fnv1a(data):
    h = 1469598103934665603
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


print("typedef struct TrivialHash {\n    int h, w, op, bin, sign;\n    bool bilinear;\n    uint64_t hash;\n"
      "} TrivialHash;")
print("static const TrivialHash trivial_hashes[] = {")
for h, w in ((32, 32), (17, 23)):
    pattern = torch.tensor([(i * 7919 + 13) % 251 for i in range(h * w * 3)], dtype=torch.uint8)
    image = pattern.reshape(h, w, 3).permute(2, 0, 1).contiguous()
    for name in names:
        magnitudes, signed = space[name]
        for k in ([0] if magnitudes.ndim == 0 else [5, 12, 21, 30]):
            for sign in ([1, -1] if signed else [1]):
                for bilinear in ([False, True] if name in GEOMETRIC else [False]):
                    mode = InterpolationMode.BILINEAR if bilinear else InterpolationMode.NEAREST
                    out = _apply_op(image.clone(), name, magnitude(name, k, sign), interpolation=mode, fill=None)
                    print("    {%d, %d, %s, %d, %d, %s, 0x%016xull}," % (
                        h, w, enums[names.index(name)], k, sign, "true" if bilinear else "false",
                        fnv1a(bytes(values(out)))))
print("};")
