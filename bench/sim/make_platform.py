#!/usr/bin/env python3
"""One description of a simulated cluster, three files from it: a SimGrid platform, an SMPI hostfile and a
Slurm topology.conf (docs/SIMULATION.md "Simulated scale").

    bench/sim/make_platform.py --topology fat-tree --ranks 256 --ranks-per-node 8 --nodes-per-switch 8 --out DIR

writes DIR/platform.xml (one SimGrid cluster zone: every node a host with one core per rank, its loopback the
NVLink-class link between the ranks of a node, the inter-node links of the chosen topology), DIR/hostfile
(each node named once per rank, so ranks 0..R-1 share node 0), DIR/topology.conf (the switches over the nodes,
for UBEP_TOPOLOGY_FILE) and DIR/description.json (what was asked and derived, for the run's table).

Topologies:
  fat-tree   two levels: leaves of --nodes-per-switch nodes, --spines spine switches, every leaf with one
             link to each spine; oversubscription = nodes-per-switch / spines (2:1 by default)
  dragonfly  --groups groups of --chassis chassis of --routers routers of --nodes-per-switch nodes each
             (SimGrid's DRAGONFLY: all-to-all links inside a chassis, between the chassis of a group and between
             groups); topology.conf describes it as the tree router < chassis < group < system
  crossbar   the shape of tests/multinode/emulate.sh, the calibration platform of bench/sim/calibrate.sh: every
             node on its own full-duplex link (--link-bw, --link-lat) to its switch, --switches switches
             (contiguous blocks of nodes, the emulation's bridges) joined by a spine, each switch's uplink
             --spine-bw / --spine-lat (emulate.sh --spine-rate / --spine-delay); explicit routes, up to 64 nodes.
             --host-bw B adds one SHARED link of bandwidth B that every inter-node route crosses: the machine
             that emulates the nodes, whose cores run the TCP stack of all of them (bench/sim/calibrate.sh)
"""
import argparse
import json
import math
import os
import sys


def slurm_range(prefix, lo, hi):
    return f"{prefix}{lo}" if lo == hi else f"{prefix}[{lo}-{hi}]"


def fat_tree(a, nodes):
    s = a.nodes_per_switch
    if nodes % s:
        sys.exit(f"make_platform.py: {nodes} nodes are not a whole number of leaves of {s} nodes (--nodes-per-switch)")
    leaves = nodes // s
    spines = a.spines or max(1, s // 2)
    # SimGrid: levels; children per switch (level 1, level 2); parents per child; links per child-parent pair.
    # Node i hangs off leaf i / s (SimGrid labels nodes with the leaf index as their second digit).
    params = f"2;{s},{leaves};1,{spines};1,1"
    conf = [f"SwitchName=leaf{l} Nodes={slurm_range(a.prefix, l * s, l * s + s - 1)}" for l in range(leaves)]
    if leaves > 1:
        conf.append(f"SwitchName=spine Switches={slurm_range('leaf', 0, leaves - 1)}")
    derived = {"leaves": leaves, "spines": spines, "oversubscription": s / spines}
    return 'topology="FAT_TREE" topo_parameters="%s"' % params, conf, derived


def dragonfly(a, nodes):
    per_group = a.chassis * a.routers * a.nodes_per_switch
    if nodes % per_group:
        sys.exit(f"make_platform.py: {nodes} nodes are not a whole number of groups of {per_group} "
                 f"(--chassis {a.chassis} x --routers {a.routers} x --nodes-per-switch {a.nodes_per_switch})")
    groups = nodes // per_group
    # SimGrid: groups,links between two groups; chassis,links; routers,links; nodes per router.
    # Node i: router i / n, chassis i / (n * routers), group i / per_group.
    params = f"{groups},{a.global_links};{a.chassis},{a.chassis_links};{a.routers},1;{a.nodes_per_switch}"
    conf = []
    n = a.nodes_per_switch
    for g in range(groups):
        for c in range(a.chassis):
            for r in range(a.routers):
                first = ((g * a.chassis + c) * a.routers + r) * n
                conf.append(f"SwitchName=g{g}c{c}r{r} Nodes={slurm_range(a.prefix, first, first + n - 1)}")
            conf.append(f"SwitchName=g{g}c{c} Switches={slurm_range(f'g{g}c{c}r', 0, a.routers - 1)}")
        conf.append(f"SwitchName=g{g} Switches={slurm_range(f'g{g}c', 0, a.chassis - 1)}")
    if groups > 1:
        conf.append(f"SwitchName=system Switches={slurm_range('g', 0, groups - 1)}")
    derived = {"groups": groups}
    return 'topology="DRAGONFLY" topo_parameters="%s"' % params, conf, derived


def crossbar(a, nodes):
    sw = a.switches
    if nodes % sw:
        sys.exit(f"make_platform.py: {nodes} nodes do not split evenly over {sw} switches (--switches)")
    if nodes > 64:
        sys.exit(f"make_platform.py: crossbar writes every route out; {nodes} nodes is above its 64 (use fat-tree)")
    per = nodes // sw
    conf = [f"SwitchName=sw{k} Nodes={slurm_range(a.prefix, k * per, k * per + per - 1)}" for k in range(sw)]
    if sw > 1:
        conf.append(f"SwitchName=top Switches={slurm_range('sw', 0, sw - 1)}")
    return None, conf, {"switches": sw, "spine_bw": a.spine_bw or a.link_bw, "spine_lat": a.spine_lat,
                        "host_bw": a.host_bw or None}


def crossbar_zone(a, nodes):
    """The crossbar platform as one zone with Full routing: a node's link and its switch's uplink are
    SPLITDUPLEX (each direction its own bandwidth, as emulate.sh shapes each direction), the loopback between
    the ranks of a node FATPIPE (as a SimGrid cluster's)."""
    h = lambda n: f"{a.prefix}{n}"
    per = nodes // a.switches
    out = ['  <zone id="ubep-sim" routing="Full">']
    for n in range(nodes):
        out.append(f'    <host id="{h(n)}" speed="{a.speed}" core="{a.ranks_per_node}"/>')
    for n in range(nodes):
        out.append(f'    <link id="{h(n)}-nic" bandwidth="{a.link_bw}" latency="{a.link_lat}" sharing_policy="SPLITDUPLEX"/>')
        out.append(f'    <link id="{h(n)}-loop" bandwidth="{a.node_bw}" latency="{a.node_lat}" sharing_policy="FATPIPE"/>')
    if a.host_bw:
        out.append(f'    <link id="emulating-host" bandwidth="{a.host_bw}" latency="0us" sharing_policy="SHARED"/>')
    if a.switches > 1:
        for k in range(a.switches):
            out.append(f'    <link id="sw{k}-up" bandwidth="{a.spine_bw or a.link_bw}" latency="{a.spine_lat}" '
                       'sharing_policy="SPLITDUPLEX"/>')
    for s in range(nodes):
        out.append(f'    <route src="{h(s)}" dst="{h(s)}"><link_ctn id="{h(s)}-loop"/></route>')
        for d in range(nodes):
            if d == s:
                continue
            links = [f'<link_ctn id="{h(s)}-nic" direction="UP"/>']
            if a.host_bw:
                links.append('<link_ctn id="emulating-host"/>')
            if s // per != d // per:
                links += [f'<link_ctn id="sw{s // per}-up" direction="UP"/>',
                          f'<link_ctn id="sw{d // per}-up" direction="DOWN"/>']
            links.append(f'<link_ctn id="{h(d)}-nic" direction="DOWN"/>')
            out.append(f'    <route src="{h(s)}" dst="{h(d)}" symmetrical="NO">{"".join(links)}</route>')
    out.append("  </zone>")
    return "\n".join(out) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--topology", choices=["fat-tree", "dragonfly", "crossbar"], default="fat-tree")
    p.add_argument("--ranks", type=int, required=True, help="simulated MPI ranks")
    p.add_argument("--ranks-per-node", type=int, default=8, help="ranks (GPUs) per node, joined by the loopback")
    p.add_argument("--nodes-per-switch", type=int, default=4, help="nodes per leaf switch (fat-tree, crossbar "
                   "ignores it) or per router (dragonfly)")
    p.add_argument("--spines", type=int, default=0, help="fat-tree spine switches (default nodes-per-switch/2)")
    p.add_argument("--groups-links", dest="global_links", type=int, default=1, help="dragonfly links between two groups")
    p.add_argument("--chassis", type=int, default=2, help="dragonfly chassis per group")
    p.add_argument("--chassis-links", type=int, default=1, help="dragonfly links between two chassis of a group")
    p.add_argument("--routers", type=int, default=4, help="dragonfly routers per chassis")
    p.add_argument("--switches", type=int, default=1, help="crossbar: switches over contiguous blocks of nodes")
    p.add_argument("--spine-bw", default="", help="crossbar: each switch's uplink to the spine (default --link-bw)")
    p.add_argument("--spine-lat", default="0us", help="crossbar: latency of each switch's uplink")
    p.add_argument("--host-bw", default="", help="crossbar: one shared link every inter-node route crosses (the "
                   "emulating machine's CPU); default none")
    p.add_argument("--link-bw", default="400Gbps", help="every inter-node link (SimGrid units: 400Gbps, 50GBps)")
    p.add_argument("--link-lat", default="1us", help="latency of every inter-node link")
    p.add_argument("--node-bw", default="900GBps", help="between the ranks of one node (the host's loopback)")
    p.add_argument("--node-lat", default="0.5us", help="latency between the ranks of one node")
    p.add_argument("--speed", default="1Tf", help="host core speed (compute is simulated by the bench)")
    p.add_argument("--prefix", default="sim-", help="host name prefix (hosts are <prefix>0 .. <prefix>N-1)")
    p.add_argument("--out", required=True, help="directory for platform.xml, hostfile, topology.conf")
    a = p.parse_args()

    if a.ranks <= 0 or a.ranks_per_node <= 0 or a.nodes_per_switch <= 0:
        sys.exit("make_platform.py: --ranks, --ranks-per-node and --nodes-per-switch must be positive")
    if a.ranks % a.ranks_per_node:
        sys.exit(f"make_platform.py: --ranks {a.ranks} is not a multiple of --ranks-per-node {a.ranks_per_node}")
    nodes = a.ranks // a.ranks_per_node
    if a.topology == "fat-tree":
        topo, conf, derived = fat_tree(a, nodes)
    elif a.topology == "dragonfly":
        topo, conf, derived = dragonfly(a, nodes)
    else:
        topo, conf, derived = crossbar(a, nodes)

    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "platform.xml"), "w") as f:
        f.write("<?xml version='1.0'?>\n")
        f.write('<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">\n')
        f.write(f"<!-- generated by bench/sim/make_platform.py {' '.join(sys.argv[1:])} -->\n")
        f.write('<platform version="4.1">\n')
        if topo is None:
            f.write(crossbar_zone(a, nodes))
        else:
            f.write(f'  <cluster id="ubep-sim" prefix="{a.prefix}" suffix="" radical="0-{nodes - 1}" '
                    f'speed="{a.speed}" core="{a.ranks_per_node}" bw="{a.link_bw}" lat="{a.link_lat}" '
                    f'loopback_bw="{a.node_bw}" loopback_lat="{a.node_lat}" {topo}/>\n')
        f.write("</platform>\n")
    with open(os.path.join(a.out, "hostfile"), "w") as f:
        for n in range(nodes):
            f.write(f"{a.prefix}{n}\n" * a.ranks_per_node)
    with open(os.path.join(a.out, "topology.conf"), "w") as f:
        f.write(f"# generated by bench/sim/make_platform.py {' '.join(sys.argv[1:])}\n")
        f.write("\n".join(conf) + "\n")
    desc = {"topology": a.topology, "ranks": a.ranks, "ranks_per_node": a.ranks_per_node, "nodes": nodes,
            "nodes_per_switch": a.nodes_per_switch, "link_bw": a.link_bw, "link_lat": a.link_lat,
            "node_bw": a.node_bw, "node_lat": a.node_lat, **derived}
    with open(os.path.join(a.out, "description.json"), "w") as f:
        json.dump(desc, f, indent=1)
        f.write("\n")
    print(json.dumps(desc))


if __name__ == "__main__":
    main()
