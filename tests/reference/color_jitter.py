"""color_jitter.py: writes tests/unit/color_reference.h, torchvision's colour changes
(the functions ColorJitter and RandomGrayscale apply) on two small float64 images, for tests/unit/augment.c
to hold ddp_color_image to. adjust_hue rounds to float32 on the way: its steps are taken
here in float64. Run with a Python that has torchvision:
    python3 tests/reference/color_jitter.py > tests/unit/color_reference.h
"""
import torch
import torchvision
import torchvision.transforms._functional_tensor as FT
import torchvision.transforms.functional as F

# An RGB image of 4 x 5 pixels: greys (r = g = b, black and white among them), each
# channel the largest, ties for the largest, and values at 0 and 255.
rgb_bytes = [
    [0, 0, 0], [255, 255, 255], [128, 128, 128], [255, 0, 0], [0, 255, 0],
    [0, 0, 255], [200, 200, 10], [10, 200, 200], [200, 10, 200], [30, 60, 90],
    [90, 60, 30], [60, 90, 30], [250, 3, 128], [17, 240, 99], [101, 102, 103],
    [180, 120, 240], [5, 5, 6], [254, 1, 254], [77, 200, 31], [240, 230, 220],
]
grey_bytes = [0, 255, 128, 3, 250, 17, 99, 180, 60, 200, 31, 77, 240, 101, 5, 254, 130, 90, 45, 220]
rgb = torch.tensor(rgb_bytes, dtype=torch.float64).reshape(4, 5, 3).permute(2, 0, 1) / 255
grey = torch.tensor(grey_bytes, dtype=torch.float64).reshape(1, 4, 5) / 255



def adjust_hue64(image, factor):
    """F.adjust_hue without its rounding to float32: its own steps, in float64."""
    if image.shape[0] == 1:
        return image
    h, s, v = FT._rgb2hsv(image).unbind(dim=-3)
    return FT._hsv2rgb(torch.stack(((h + factor) % 1.0, s, v), dim=-3))


# adjust_hue64 against F.adjust_hue, to float32's rounding
assert (adjust_hue64(rgb, 0.3) - F.adjust_hue(rgb, 0.3)).abs().max() < 1e-6

BRIGHTNESS, CONTRAST, SATURATION, HUE, GREY = range(5)
functions = {BRIGHTNESS: F.adjust_brightness, CONTRAST: F.adjust_contrast,
             SATURATION: F.adjust_saturation, HUE: adjust_hue64,
             GREY: lambda image, _: F.rgb_to_grayscale(image, num_output_channels=3)}  # RandomGrayscale's
names = ["DDP_COLOR_BRIGHTNESS", "DDP_COLOR_CONTRAST", "DDP_COLOR_SATURATION", "DDP_COLOR_HUE", "DDP_COLOR_GREY"]

cases = [  # (image, [(change, factor), ...] in the order applied)
    ("rgb", [(BRIGHTNESS, 1.37)]), ("rgb", [(BRIGHTNESS, 0.6)]),
    ("rgb", [(CONTRAST, 1.45)]), ("rgb", [(CONTRAST, 0.3)]),
    ("grey", [(CONTRAST, 0.7)]), ("grey", [(CONTRAST, 1.6)]), ("grey", [(BRIGHTNESS, 1.25)]),
    ("rgb", [(SATURATION, 1.8)]), ("rgb", [(SATURATION, 0.2)]), ("rgb", [(SATURATION, 0)]),
    ("rgb", [(HUE, 0.13)]), ("rgb", [(HUE, -0.37)]), ("rgb", [(HUE, 0.5)]), ("rgb", [(HUE, -0.5)]),
    ("rgb", [(HUE, 0.02), (CONTRAST, 1.3), (BRIGHTNESS, 1.2), (SATURATION, 0.7)]),
    ("rgb", [(SATURATION, 1.5), (BRIGHTNESS, 0.8), (HUE, -0.2), (CONTRAST, 0.6)]),
    ("rgb", [(GREY, 0)]), ("rgb", [(BRIGHTNESS, 1.3), (GREY, 0)]),
]


def values(image):  # [c, h, w] as the runtime holds it, [h, w, c]
    return image.permute(1, 2, 0).reshape(-1).tolist()


def numbers(xs, indent="        ", per=3):  # per a line: an RGB pixel
    xs = ["%.17g" % x for x in xs]
    return ("\n" + indent).join(", ".join(xs[i:i + per]) + ("," if i + per < len(xs) else "")
                                 for i in range(0, len(xs), per))


print("/* Made by tests/reference/color_jitter.py from torchvision %s (float64): do not edit. */"
      % torchvision.__version__)
print("enum { COLOR_PIXELS = 20 };")
print("static const double color_rgb[3 * COLOR_PIXELS] = {\n    %s};" % numbers(values(rgb), "    "))
print("static const double color_grey[COLOR_PIXELS] = {\n    %s};" % numbers(values(grey), "    "))
print("typedef struct ColorCase {\n    int channels;\n    ddp_color color;\n    double expect[3 * COLOR_PIXELS];\n} ColorCase;")
print("static const ColorCase color_cases[] = {")
for image_name, steps in cases:
    image = rgb if image_name == "rgb" else grey
    for change, factor in steps:
        image = functions[change](image, factor)
    print("    {%d, {%d, {%s}, {%s}},\n     {%s}}," % (
        3 if image_name == "rgb" else 1, len(steps), ", ".join(names[c] for c, _ in steps),
        numbers(f for _, f in steps), numbers(values(image))))
print("};")
