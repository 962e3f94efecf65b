"""`keras-vit report`: the results of evaluate / vtab runs in the layout of the paper's Table 2.

    keras-vit report runs/real runs/cifar10 runs/cifar100 runs/pets runs/flowers runs/vtab --out runs/table2

Rows: ImageNet, ImageNet ReaL, CIFAR-10, CIFAR-100, Oxford-IIIT Pets, Oxford Flowers-102, VTAB
(19 tasks); one column per model (runs of the same weights share one), then the paper's
figures for ViT-H/14, ViT-L/16 (JFT-300M) and BiT-L, labelled as the paper's. Prints the
markdown table; with --out writes table2.md and table2.csv.
"""


from keras_vit.commands import arguments


def add_parser(subparsers):
    parser = subparsers.add_parser("report", help="gather evaluate / vtab runs into the paper's Table 2",
                                   description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders of keras-vit evaluate or vtab")
    parser.add_argument("--no-paper", action="store_true", help="leave out the paper's columns")
    parser.add_argument("--out", type=arguments.out_folder, default=None, help="folder for table2.md and table2.csv")
    parser.set_defaults(func=report)
    return parser


def report(args):
    import os

    from keras_vit.evaluation.report import table2, to_csv, to_markdown

    table = table2(args.runs, paper=not args.no_paper)
    markdown = to_markdown(table)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "table2.md"), "w") as f:
            f.write(markdown)
        with open(os.path.join(args.out, "table2.csv"), "w", newline="") as f:
            f.write(to_csv(table))
    print(markdown, end="")
    return 0
