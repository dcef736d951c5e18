package k8slab

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Pool is a set of simulated GPU nodes labelled and tainted as
// docs/kubernetes.md tells users to label and taint a pdserve pool:
// label pdserve.io/pool=NAME, taint pdserve.io/pool=NAME:NoSchedule, plus
// the nvidia.com/gpu:NoSchedule taint GPU node pools commonly carry.
type Pool struct {
	Name  string // prefill or decode
	Nodes int
	GPUs  int // nvidia.com/gpu capacity of each node
}

// DefaultPools mirror the docs' example: three prefill and two decode nodes.
var DefaultPools = []Pool{{Name: "prefill", Nodes: 3, GPUs: 8}, {Name: "decode", Nodes: 2, GPUs: 8}}

// KwokNodeName is the name of the i-th (from 1) node of a pool.
func KwokNodeName(pool string, i int) string { return "kwok-" + pool + "-" + strconv.Itoa(i) }

const (
	kwokAnnotation = "kwok.x-k8s.io/node"
	poolLabel      = "pdserve.io/pool"
)

func kwokNode(p Pool, i int) *corev1.Node {
	name := KwokNodeName(p.Name, i)
	rl := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("64"),
		corev1.ResourceMemory: resource.MustParse("512Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
		"nvidia.com/gpu":      *resource.NewQuantity(int64(p.GPUs), resource.DecimalSI),
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{kwokAnnotation: "fake", "node.alpha.kubernetes.io/ttl": "0"},
			Labels: map[string]string{
				"type": "kwok", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
				"kubernetes.io/role": "agent", "node-role.kubernetes.io/agent": "", poolLabel: p.Name,
				"nvidia.com/gpu.present": "true",
			},
		},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{
			{Key: poolLabel, Value: p.Name, Effect: corev1.TaintEffectNoSchedule},
			{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule},
		}},
		Status: corev1.NodeStatus{Capacity: rl, Allocatable: rl},
	}
}

// upKwok starts kwok, managing the nodes annotated kwok.x-k8s.io/node=fake,
// creates the pools' nodes that do not exist and waits until every one is
// Ready.
func (l *Lab) upKwok(ctx context.Context) error {
	pid, err := l.start(proc{name: "kwok", bin: l.bins.Path("kwok"), args: []string{
		"--kubeconfig=" + l.p("kubeconfig/kwok.conf"), "--config=" + l.p("kwok/kwok.yaml"),
		"--manage-all-nodes=false", "--manage-nodes-with-annotation-selector=" + kwokAnnotation + "=fake",
		"--cidr=" + KwokPodCIDR, "--node-ip=" + l.nodeIP.String(), "--node-lease-duration-seconds=40",
	}})
	if err != nil {
		return err
	}
	cs, err := l.Client()
	if err != nil {
		return err
	}
	var names []string
	for _, p := range l.opt.Pools {
		for i := 1; i <= p.Nodes; i++ {
			n := kwokNode(p, i)
			names = append(names, n.Name)
			if _, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("k8slab: kwok node %s: %w", n.Name, err)
			}
		}
	}
	return l.waitFor(ctx, "kwok", "simulated GPU nodes Ready", 90*time.Second, func() error {
		if !pidAlive(pid) {
			return fatalError{fmt.Errorf("kwok exited")}
		}
		for _, name := range names {
			n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !nodeReady(n) {
				return fmt.Errorf("node %s not Ready", name)
			}
		}
		return nil
	})
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

var resourceOne = resource.MustParse("1")
