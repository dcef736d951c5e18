// Package actuatortest is a fake of the Kubernetes API that the planner's
// actuators use (actuator.Client) for their tests: client-go's object
// tracker and reactors, over the apps/v1 and core/v1 groups only, with
// the Deployments' scale subresource, which the tracker lacks, served
// from the Deployment. It replaces client-go's fake clientset, which
// compiles a fake of every API group.
package actuatortest

import (
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	appsv1client "k8s.io/client-go/kubernetes/typed/apps/v1"
	fakeappsv1 "k8s.io/client-go/kubernetes/typed/apps/v1/fake"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	fakecorev1 "k8s.io/client-go/kubernetes/typed/core/v1/fake"
	k8stesting "k8s.io/client-go/testing"
)

// Deployments is the resource of apps/v1 Deployments, for the tracker.
var Deployments = schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}

// Fake is an actuator.Client over an object tracker. Add reactors in
// front of its own with PrependReactor (errors, call logs); Actions lists
// the calls it served. Safe for concurrent use.
type Fake struct {
	k8stesting.Fake
	tracker k8stesting.ObjectTracker
	scaleMu sync.Mutex // one scale update's get-modify-update of its Deployment
}

// NewFake returns a Fake holding objs (Deployments, Pods, …). It panics
// on an object of another group, as client-go's fake clientset does on one
// it cannot hold.
func NewFake(objs ...runtime.Object) *Fake {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{appsv1.AddToScheme, corev1.AddToScheme, autoscalingv1.AddToScheme} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	f := &Fake{tracker: k8stesting.NewObjectTracker(scheme, serializer.NewCodecFactory(scheme).UniversalDecoder())}
	for _, o := range objs {
		if err := f.tracker.Add(o); err != nil {
			panic(err)
		}
	}
	f.AddReactor("get", "deployments", f.getScale)
	f.AddReactor("update", "deployments", f.updateScale)
	f.AddReactor("*", "*", k8stesting.ObjectReaction(f.tracker))
	return f
}

// Tracker returns the objects the Fake holds.
func (f *Fake) Tracker() k8stesting.ObjectTracker { return f.tracker }

// AppsV1 is the apps/v1 group's client.
func (f *Fake) AppsV1() appsv1client.AppsV1Interface { return &fakeappsv1.FakeAppsV1{Fake: &f.Fake} }

// CoreV1 is the core/v1 group's client.
func (f *Fake) CoreV1() corev1client.CoreV1Interface { return &fakecorev1.FakeCoreV1{Fake: &f.Fake} }

// getScale serves a Deployment's scale as the API server does: replicas
// from spec and status, the selector from spec.selector.
func (f *Fake) getScale(a k8stesting.Action) (bool, runtime.Object, error) {
	if a.GetSubresource() != "scale" {
		return false, nil, nil
	}
	obj, err := f.tracker.Get(Deployments, a.GetNamespace(), a.(k8stesting.GetAction).GetName())
	if err != nil {
		return true, nil, err
	}
	return true, scaleOf(obj.(*appsv1.Deployment)), nil
}

// updateScale sets a Deployment's spec.replicas from a scale.
func (f *Fake) updateScale(a k8stesting.Action) (bool, runtime.Object, error) {
	if a.GetSubresource() != "scale" {
		return false, nil, nil
	}
	f.scaleMu.Lock()
	defer f.scaleMu.Unlock()
	s := a.(k8stesting.UpdateAction).GetObject().(*autoscalingv1.Scale)
	obj, err := f.tracker.Get(Deployments, a.GetNamespace(), s.Name)
	if err != nil {
		return true, nil, err
	}
	d := obj.(*appsv1.Deployment).DeepCopy()
	d.Spec.Replicas = &s.Spec.Replicas
	if err := f.tracker.Update(Deployments, d, a.GetNamespace()); err != nil {
		return true, nil, err
	}
	return true, scaleOf(d), nil
}

func scaleOf(d *appsv1.Deployment) *autoscalingv1.Scale {
	s := &autoscalingv1.Scale{
		ObjectMeta: metav1.ObjectMeta{Name: d.Name, Namespace: d.Namespace},
		Status:     autoscalingv1.ScaleStatus{Replicas: d.Status.Replicas},
	}
	if d.Spec.Replicas != nil {
		s.Spec.Replicas = *d.Spec.Replicas
	}
	if d.Spec.Selector != nil {
		s.Status.Selector = metav1.FormatLabelSelector(d.Spec.Selector)
	}
	return s
}
