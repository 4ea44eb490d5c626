"""auto_augment.py: writes tests/unit/auto_augment_reference.h, torchvision's
TrivialAugmentWide operations (autoaugment._apply_op, on uint8 tensors, as the
transform makes them) on two small images, RGB and grey, at magnitudes of its table of
31 bins, for tests/unit/augment.c to hold ddp_image_op_apply and ddp_image_op_magnitude
to, and hashes of the same on two larger images (and of RandAugment's two operations
in a row); then magnitudes of TrivialAugmentWide's and RandAugment's tables, and
AutoAugment's policies. Run with a Python that has torchvision:
    python3 tests/reference/auto_augment.py > tests/unit/auto_augment_reference.h
"""
import torch
import torchvision
from torchvision.transforms import InterpolationMode
from torchvision.transforms.autoaugment import (AutoAugment, AutoAugmentPolicy, RandAugment, TrivialAugmentWide,
                                                _apply_op)

H, W = 7, 6
generator = torch.Generator().manual_seed(3)
rgb = torch.randint(0, 256, (3, H, W), dtype=torch.uint8, generator=generator)
rgb[:, 0, 0] = torch.tensor([0, 0, 0])  # a black and a white pixel, and a grey one
rgb[:, 1, 1] = torch.tensor([255, 255, 255])
rgb[:, 2, 3] = torch.tensor([77, 77, 77])
grey = torch.randint(20, 200, (1, H, W), dtype=torch.uint8, generator=generator)

space = TrivialAugmentWide()._augmentation_space(31)
names = list(space.keys())
enums = ["DDP_OP_IDENTITY", "DDP_OP_SHEAR_X", "DDP_OP_SHEAR_Y", "DDP_OP_TRANSLATE_X",
         "DDP_OP_TRANSLATE_Y", "DDP_OP_ROTATE", "DDP_OP_BRIGHTNESS", "DDP_OP_COLOR",
         "DDP_OP_CONTRAST", "DDP_OP_SHARPNESS", "DDP_OP_POSTERIZE", "DDP_OP_SOLARIZE",
         "DDP_OP_AUTOCONTRAST", "DDP_OP_EQUALIZE"]
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


print("/* Made by tests/reference/auto_augment.py from torchvision %s: do not edit. */"
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

# The magnitudes of both tables, each operation with one: of 31 bins at both ends and
# about the middle (linspace's two halves), and every one of 10; RandAugment's
# translations for images of 7 x 6 and 224 x 200 (they follow the sides).
print("typedef struct MagnitudeCase {\n    int kind, op, bins, bin, h, w;\n    double magnitude;\n} MagnitudeCase;")
print("static const MagnitudeCase magnitude_cases[] = {")
for bins, ks in ((31, (0, 1, 7, 14, 15, 16, 22, 29, 30)), (10, range(10))):
    for kind, sizes in (("DDP_AUGMENT_TRIVIAL", ((7, 6),)), ("DDP_AUGMENT_RAND", ((7, 6), (224, 200)))):
        for h, w in sizes:
            table = (TrivialAugmentWide()._augmentation_space(bins) if kind == "DDP_AUGMENT_TRIVIAL"
                     else RandAugment()._augmentation_space(bins, (h, w)))
            for name in names:
                magnitudes, _ = table[name]
                if magnitudes.ndim == 0 or (h == 224 and not name.startswith("Translate")):
                    continue
                for k in ks:
                    m = float(magnitudes[k].item())
                    print("    {%s, %s, %d, %d, %d, %d, %r}," % (kind, enums[names.index(name)], bins, k, h, w, m))
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

# AutoAugment's three policies, step by step (the operation, its probability and its
# bin of 10, or -1), and Invert, which only they use, on the 32 x 32 pattern.
print("typedef struct PolicyStep {\n    int policy, index, which, op;\n    double probability;\n"
      "    int bin;\n} PolicyStep;")
print("static const PolicyStep policy_steps[] = {")
for policy, cname in ((AutoAugmentPolicy.IMAGENET, "DDP_POLICY_IMAGENET"),
                      (AutoAugmentPolicy.CIFAR10, "DDP_POLICY_CIFAR10"), (AutoAugmentPolicy.SVHN, "DDP_POLICY_SVHN")):
    for index, pair in enumerate(AutoAugment(policy).policies):
        for which, (name, p, m) in enumerate(pair):
            op = "DDP_OP_INVERT" if name == "Invert" else enums[names.index(name)]
            print("    {%s, %d, %d, %s, %r, %d}," % (cname, index, which, op, p, -1 if m is None else m))
print("};")
pattern = torch.tensor([(i * 7919 + 13) % 251 for i in range(32 * 32 * 3)], dtype=torch.uint8)
inverted = _apply_op(pattern.reshape(32, 32, 3).permute(2, 0, 1).contiguous(), "Invert", 0.0,
                     interpolation=InterpolationMode.NEAREST, fill=None)
print("static const uint64_t inverted_hash = 0x%016xull;" % fnv1a(bytes(values(inverted))))

# RandAugment's two operations in a row at magnitude 9 of 31 (its default) on the 32 x
# 32 pattern: the hash of the result.
print("typedef struct RandPair {\n    int first, second, first_sign, second_sign;\n    uint64_t hash;\n} RandPair;")
print("static const RandPair rand_pairs[] = {")
rand_space = RandAugment()._augmentation_space(31, (32, 32))
pattern = torch.tensor([(i * 7919 + 13) % 251 for i in range(32 * 32 * 3)], dtype=torch.uint8)
for first, second, s1, s2 in (("Rotate", "Posterize", -1, 1), ("ShearX", "Equalize", 1, 1),
                              ("TranslateY", "Contrast", 1, -1), ("Solarize", "TranslateX", 1, -1),
                              ("Sharpness", "Color", -1, 1), ("AutoContrast", "Brightness", 1, 1)):
    image = pattern.reshape(32, 32, 3).permute(2, 0, 1).contiguous()
    for name, sign in ((first, s1), (second, s2)):
        magnitudes, signed = rand_space[name]
        m = float(magnitudes[9].item()) if magnitudes.ndim > 0 else 0.0
        image = _apply_op(image, name, m * (sign if signed else 1), interpolation=InterpolationMode.NEAREST,
                          fill=None)
    print("    {%s, %s, %d, %d, 0x%016xull}," % (enums[names.index(first)], enums[names.index(second)], s1, s2,
                                                 fnv1a(bytes(values(image)))))
print("};")
