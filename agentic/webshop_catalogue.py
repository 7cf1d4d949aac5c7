"""WebShop-mini's product catalogue: the product types, option pools, brands and text fillers, and the two
generators that turn them into the official item and goal dicts (webshop.py builds its Shop from them).

What it implements: `make_product` (one product with the official field names: Title, Description, BulletPoints,
Attributes, options, pricing; ~60 % carry an instruction) and `make_goals` (the official get_synthetic_goals: one
goal per instruction product x combination of its option values, with a price bound among the first four
multiples of 10 above the product's price). The data are written for this project (fictional brands); the field
names and goal rules follow the official webshop-minimal code. Leaves out: human goals, images, reviews.
Run: `python envs.py webshop --seed 3 --show` shows one goal and the shop it lives in.
"""
from __future__ import annotations

import itertools

PRICE_RANGE = [10.0 * i for i in range(1, 100)]   # official candidate price bounds (webshop-minimal goals.py)


COLORS = ["black", "white", "navy blue", "heather grey", "red", "olive green", "pink", "beige", "white | black",
          "light blue", "brown", "purple"]
WOODS = ["espresso", "walnut", "white", "black", "natural", "grey"]
CLOTH = ["x-small", "small", "medium", "large", "x-large", "xx-large"]
# (category, product_category, query, title noun, attributes before / "with" / "for", {option: pool}, price range)
TYPES = [
    ("beauty", "Beauty & Personal Care › Skin Care › Body › Body Lotions", "body lotions", "Body Lotion",
     ["cruelty free", "paraben free", "fragrance free", "long lasting"], ["shea butter", "vitamin e", "aloe vera"],
     ["dry skin", "sensitive skin"], {"scent": ["lavender", "unscented", "coconut", "eucalyptus mint", "vanilla"],
                                      "size": ["2 fl oz", "8 fl oz", "16 fl oz (pack of 2)"]}, (6, 35)),
    ("beauty", "Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Shampoos", "shampoos", "Shampoo",
     ["sulfate free", "paraben free", "cruelty free"], ["argan oil", "tea tree", "biotin", "keratin"],
     ["dry hair", "hair growth", "damaged hair", "curly hair"], {"size": ["8.5 fl oz", "16 fl oz", "33.8 fl oz"]},
     (8, 40)),
    ("beauty", "Beauty & Personal Care › Makeup › Lips › Lipstick", "lipsticks", "Lipstick",
     ["long lasting", "waterproof", "cruelty free", "matte finish"], ["vitamin e", "hyaluronic acid"],
     ["dry lips", "everyday wear"], {"color": ["ruby red", "nude", "berry", "coral", "rose pink", "plum"]}, (5, 25)),
    ("beauty", "Beauty & Personal Care › Skin Care › Face › Serums", "face serums", "Face Serum",
     ["oil free", "fragrance free", "clinically proven"], ["hyaluronic acid", "vitamin c", "retinol", "niacinamide"],
     ["fine lines", "dark spots", "sensitive skin"], {"size": ["1 fl oz", "2 fl oz", "1 fl oz (pack of 2)"]}, (10, 60)),
    ("fashion", "Clothing, Shoes & Jewelry › Men › Clothing › Fashion Hoodies & Sweatshirts", "hoodies & sweatshirts",
     "Hoodie", ["long sleeve", "machine washable", "relaxed fit", "fleece lined"],
     ["drawstring hood", "kangaroo pocket", "zipper closure"], ["daily wear", "gym workout"],
     {"color": COLORS, "size": CLOTH}, (18, 60)),
    ("fashion", "Clothing, Shoes & Jewelry › Men › Clothing › Shirts › T-Shirts", "t-shirts", "T-Shirt",
     ["short sleeve", "machine washable", "slim fit", "moisture wicking"], ["crew neck", "v neck", "chest pocket"],
     ["daily wear", "gym workout"], {"color": COLORS, "size": CLOTH}, (8, 30)),
    ("fashion", "Clothing, Shoes & Jewelry › Women › Clothing › Dresses", "dresses", "Dress",
     ["short sleeve", "machine washable", "high waist", "elastic waist"], ["v neck", "button closure", "side pockets"],
     ["daily wear", "wedding guest", "beach vacation"], {"color": COLORS, "size": CLOTH}, (20, 70)),
    ("fashion", "Clothing, Shoes & Jewelry › Women › Shoes › Athletic › Running", "running shoes", "Running Shoe",
     ["non slip", "lightweight", "breathable"], ["memory foam", "rubber sole", "arch support"],
     ["road running", "walking", "gym workout"],
     {"color": COLORS, "size": ["6", "7", "7.5", "8", "8.5", "9", "10", "11 wide"]}, (30, 120)),
    ("fashion", "Clothing, Shoes & Jewelry › Women › Clothing › Jeans", "jeans", "Jeans",
     ["high waist", "slim fit", "stretch denim"], ["button closure", "side pockets", "ripped knees"], ["daily wear"],
     {"color": ["light blue", "dark blue", "black", "indigo"], "size": CLOTH}, (20, 80)),
    ("grocery", "Grocery & Gourmet Food › Snack Foods › Bars › Protein Bars", "protein bars", "Protein Bar",
     ["gluten free", "low sugar", "high protein", "keto friendly", "non gmo"], ["peanut butter", "almonds"],
     ["post workout", "snacking"], {"flavor name": ["dark chocolate", "sea salt caramel", "mixed berry", "original"],
                                    "size": ["12 count (pack of 1)", "24 count (pack of 2)", "6 count"]}, (10, 45)),
    ("grocery", "Grocery & Gourmet Food › Beverages › Coffee › Ground Coffee", "ground coffee", "Ground Coffee",
     ["medium roast", "dark roast", "fair trade", "organic"], ["arabica beans", "chicory"],
     ["drip coffee makers", "french press"], {"flavor name": ["original", "hazelnut", "french vanilla", "mocha"],
                                              "size": ["12 ounce", "24 ounce", "2 pound"]}, (8, 35)),
    ("grocery", "Grocery & Gourmet Food › Beverages › Tea › Herbal", "herbal teas", "Herbal Tea",
     ["caffeine free", "organic", "non gmo", "gluten free"], ["chamomile", "peppermint", "ginger", "lemon balm"],
     ["sleep support", "digestion"], {"size": ["20 count", "40 count", "100 count (pack of 4)"]}, (5, 25)),
    ("grocery", "Grocery & Gourmet Food › Snack Foods › Chips & Crisps › Potato", "potato chips", "Potato Chips",
     ["kettle cooked", "gluten free", "non gmo", "low sodium"], ["avocado oil", "sunflower oil"],
     ["lunch boxes", "party snacks"], {"flavor name": ["sea salt", "salt & vinegar", "bbq", "jalapeno"],
                                       "size": ["1 ounce (pack of 24)", "5 ounce (pack of 8)", "8 ounce"]}, (8, 30)),
    ("home", "Home & Kitchen › Bedding › Decorative Pillows, Inserts & Covers › Throw Pillow Covers",
     "throw pillow covers", "Throw Pillow Cover", ["hand painted", "machine washable", "double sided", "super soft"],
     ["hidden zipper", "velvet fabric", "linen fabric"], ["living room", "sofa couch", "bedroom"],
     {"color": COLORS, "size": ["18x18 inch", "20x20 inch", "24x24 inch", "12x20 inch"]}, (8, 30)),
    ("home", "Home & Kitchen › Bedding › Blankets & Throws › Throws", "throw blankets", "Throw Blanket",
     ["super soft", "machine washable", "lightweight", "reversible"], ["sherpa fleece", "tassels"],
     ["couch", "bed", "travel"], {"color": COLORS, "size": ["50x60 inch", "60x80 inch", "twin", "queen"]}, (15, 60)),
    ("home", "Home & Kitchen › Home Décor › Window Treatments › Curtains & Drapes", "blackout curtains",
     "Blackout Curtain", ["thermal insulated", "noise reducing", "energy saving", "machine washable"],
     ["grommet top", "rod pocket"], ["bedroom", "living room", "nursery"],
     {"color": COLORS, "size": ["52w x 63l", "52w x 84l", "52w x 95l"]}, (15, 50)),
    ("home", "Home & Kitchen › Bedding › Sheets & Pillowcases › Sheet & Pillowcase Sets", "bed sheet sets",
     "Bed Sheet Set", ["deep pocket", "wrinkle free", "breathable", "hypoallergenic"],
     ["egyptian cotton", "microfiber", "bamboo"], ["all season", "hot sleepers"],
     {"color": COLORS, "size": ["twin", "full", "queen", "king"]}, (25, 90)),
    ("home", "Home & Kitchen › Kitchen & Dining › Dining & Entertaining › Cups, Mugs & Saucers › Mugs",
     "coffee mugs", "Coffee Mug", ["dishwasher safe", "microwave safe", "lead free", "large capacity"],
     ["ceramic", "handle", "lid"], ["coffee", "tea", "hot chocolate"],
     {"color": COLORS, "size": ["12 oz", "16 oz", "set of 4"]}, (8, 30)),
    ("electronics", "Electronics › Cell Phones & Accessories › Cases, Holsters & Sleeves › Basic Cases",
     "phone cases", "Phone Case", ["shockproof", "slim fit", "wireless charging compatible", "anti scratch"],
     ["kickstand", "card holder", "screen protector"], ["daily protection", "drop protection"],
     {"color": COLORS, "style": ["iphone 13", "iphone 14 pro", "galaxy s22", "pixel 7"]}, (8, 30)),
    ("electronics", "Electronics › Computers & Accessories › Cables & Accessories › USB Cables", "usb c cables",
     "USB C Cable", ["fast charging", "braided nylon", "durable", "high speed"], ["aluminum connectors", "data sync"],
     ["android phones", "laptops", "tablets"], {"color": COLORS, "size": ["3 ft", "6 ft", "10 ft", "6 ft (2 pack)"]},
     (6, 25)),
    ("electronics", "Electronics › Headphones, Earbuds & Accessories › Earbuds", "wireless earbuds",
     "Wireless Earbuds", ["noise cancelling", "waterproof", "long battery life"],
     ["charging case", "built-in microphone", "touch control"], ["running", "workouts", "phone calls"],
     {"color": COLORS}, (20, 120)),
    ("electronics", "Electronics › Cell Phones & Accessories › Chargers & Power Adapters › Portable Power Banks",
     "portable chargers", "Portable Charger", ["fast charging", "compact", "high capacity", "lightweight"],
     ["led display", "usb c port", "dual output"], ["travel", "camping"],
     {"color": COLORS, "size": ["10000mah", "20000mah", "26800mah"]}, (15, 60)),
    ("furniture", "Home & Kitchen › Furniture › Home Office Furniture › Home Office Desk Chairs", "office chairs",
     "Office Chair", ["ergonomic", "height adjustable", "high back", "easy assembly"],
     ["lumbar support", "padded armrests", "mesh back"], ["home office", "gaming", "long hours"],
     {"color": WOODS[1:] + ["blue"]}, (50, 250)),
    ("furniture", "Home & Kitchen › Furniture › Living Room Furniture › Bookcases", "bookcases", "Bookcase",
     ["easy assembly", "sturdy", "space saving", "modern"], ["storage cabinet", "metal frame", "adjustable shelves"],
     ["living room", "home office", "kids room"], {"color": WOODS, "size": ["3 tier", "4 tier", "5 tier"]}, (40, 200)),
    ("furniture", "Home & Kitchen › Furniture › Game & Recreation Room Furniture › Home Bar Furniture › Barstools",
     "bar stools", "Bar Stool", ["swivel", "height adjustable", "backless"], ["footrest", "faux leather seat",
     "metal legs"], ["kitchen island", "counter height"], {"color": WOODS, "size": ["24 inch", "30 inch"]}, (60, 220)),
]
BRANDS = ("Lumora Vexa Quillon Brisa Northvale Kindra Oakhurst Pellio Zentro Marlo Solenne Tidewell Ardent Bramble "
          "Corvia Dunmore Elara Fennick Galvo Hartley Istra Jovia Kestrel Lanton Mirabel Novessa Orrin Pavlo Quenby "
          "Rydell Saxby Tamsin Umbra Velora Wexley Yarrow Zephra Alden Brixby Calloway").split()
FILLERS = ["Backed by our friendly customer service team.", "A thoughtful gift for family and friends.",
           "Ships in recyclable packaging.", "Thousands of happy customers every year.",
           "Please allow slight differences due to manual measurement.", "Simple to use right out of the box."]


# --------------------------------------------------------------------------------------------- catalogue
def make_product(rng, kind, asin):
    """One product dict with the official field names (Title, Description, BulletPoints, Attributes, ...)."""
    category, path, query, noun, pre, with_, for_, option_pools, (lo, hi) = kind
    brand = BRANDS[int(rng.integers(len(BRANDS)))]
    pick = lambda pool, k: [pool[i] for i in sorted(rng.choice(len(pool), size=k, replace=False))]  # noqa: E731
    a_pre, a_with, a_for = pick(pre, int(rng.integers(1, 3))), pick(with_, int(rng.integers(0, 2))), pick(for_, 1)
    title = " ".join([brand] + [a.title() for a in a_pre] + [noun])
    title += "".join(f" with {a.title()}" for a in a_with) + f" for {a_for[0].title()}"
    desc = (f"The {brand} {noun.lower()} is {' and '.join(a_pre)}" + "".join(f", made with {a}" for a in a_with)
            + f". Designed for {a_for[0]}. " + " ".join(rng.choice(FILLERS, size=2, replace=False)))
    bullets = [f"{a.upper()}: {FILLERS[int(rng.integers(len(FILLERS)))].lower()}" for a in a_pre + a_with + a_for]
    options = {} if rng.random() < 0.1 else {       # 10% of products have no options at all
        name: pick(pool, int(rng.integers(2, min(4, len(pool)) + 1))) for name, pool in option_pools.items()}
    price = round(float(rng.uniform(lo, hi)), 2)
    pricing = [price] if rng.random() < 0.75 else [price, round(price * float(rng.uniform(1.1, 1.6)), 2)]
    product = dict(asin=asin, category=category, query=query, product_category=path, name=title, Title=title,
                   Description=desc, BulletPoints=bullets, Attributes=a_pre + a_with + a_for, options=options,
                   pricing=pricing, Price=" to ".join(f"${p}" for p in pricing), Rating="N.A.", Reviews=[])
    product["price"] = pricing[0] if len(pricing) == 1 else float(rng.uniform(*pricing))  # the price that is scored
    if rng.random() < 0.6:                          # an instruction product: its goals are built below
        attrs = product["Attributes"]
        chosen = [attrs[i] for i in sorted(rng.choice(len(attrs), size=min(len(attrs), int(rng.integers(2, 4))),
                                                      replace=False))]
        head = ", ".join(a for a in chosen if a in a_pre)
        text = "Find me " + (head + " " if head else "") + query
        text += "".join(f" with {a}" for a in chosen if a in a_with)
        text += "".join(f" for {a}" for a in chosen if a in a_for)
        product["instruction_text"], product["instruction_attributes"] = text, chosen
    return product


def make_goals(products, rng):
    """Official get_synthetic_goals: one goal per (instruction product, combination of its option values)."""
    goals = []
    for p in products:
        if "instruction_text" not in p:
            continue
        bounds = [x for x in PRICE_RANGE if x > p["price"]][:4]
        upper = float(max(rng.choice(bounds, size=2, replace=False)))   # prices stay far below 980: >= 2 bounds
        names = sorted(p["options"])
        for combo in itertools.product(*(p["options"][n] for n in names)):
            goal_options = dict(zip(names, combo))
            option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
            goals.append(dict(asin=p["asin"], category=p["category"], query=p["query"], name=p["Title"],
                              product_category=p["product_category"], attributes=p["instruction_attributes"],
                              price_upper=upper, goal_options=goal_options,
                              instruction_text=p["instruction_text"] + (" with " + option_text if option_text else "")
                              + f", and price lower than {upper:.2f} dollars"))
    return goals
